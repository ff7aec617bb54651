"""Tools the assistant runs: the code interpreter's sandbox (`sandbox.py`)."""
