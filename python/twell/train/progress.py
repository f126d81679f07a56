"""The progress display of twell.train: a tqdm bar on stderr where tqdm is installed (updated
every 30 s when stderr is not a terminal), else one line per log record on stdout."""
import sys


def _postfix(record):
    parts = []
    if record.get("train_ce") is not None:
        parts.append(f"ce {record['train_ce']:.3f}")
    if record.get("val_ce") is not None:
        parts.append(f"val {record['val_ce']:.3f}")
    if record.get("l1_term") is not None:
        parts.append(f"l1 {record['l1_term']:.3g}")
    if record.get("mean_density") is not None:
        parts.append(f"dens {100 * record['mean_density']:.2f}%")
    dead = [d for d in record.get("dead") or [] if d is not None]
    if dead:
        parts.append(f"dead {sum(dead)}")
    rows = [r for r in record.get("sparse_rows") or [] if r is not None]
    if rows:
        parts.append(f"sparse rows {100 * sum(rows) / len(rows):.0f}%")
    if record.get("silent"):
        parts.append(f"SILENT {len(record['silent'])}")
    if record.get("tokens_per_s"):
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    return " ".join(parts)


class Progress:
    def __init__(self, total, enabled=True):
        self.total, self.enabled, self.bar = total, enabled, None

    def start(self, initial):
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=self.total, initial=initial, unit="step", file=sys.stderr,
                        dynamic_ncols=tty, mininterval=0.5 if tty else 30.0)

    def update(self, step, record):
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if record is not None:
                self.bar.set_postfix_str(_postfix(record), refresh=False)
        elif record is not None and self.enabled:
            print(f"step {step}/{self.total}: {_postfix(record)}", flush=True)

    def write(self, text):
        """A line that stays (warnings): above the bar, or on stderr."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
