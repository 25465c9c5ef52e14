"""``python -m agentstream.cli …``: the same as the ``agentstream`` command."""

from agentstream.cli import main

if __name__ == "__main__":
    main()
