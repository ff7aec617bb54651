"""Tools the assistant runs: their contract (`base.py`) and the code sandbox (`sandbox.py`)."""
