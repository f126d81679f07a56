"""Argument types shared by the benchmark scripts' command lines."""
import argparse


def positive_ints(text):
    """"1,16" -> [1, 16]: comma-separated integers >= 1 (argparse's error otherwise)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values
