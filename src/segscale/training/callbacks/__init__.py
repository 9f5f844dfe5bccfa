"""The Lightning callbacks of ``conf/callbacks``: one per module, named for what it does."""
