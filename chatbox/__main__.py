"""`python -m chatbox` is the `chatbox` command."""

from chatbox.cli import main

main()
