"""python -m twell.train: see twell.train.cli."""
from twell.train.cli import main

main()
