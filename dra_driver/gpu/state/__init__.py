"""The node's prepared claims: planning, the prepare/unprepare transaction, checkpoint, recovery."""

#: The checkpoint's name in the state directory (here so start-up can check it cheaply).
CHECKPOINT_FILE = "checkpoint.json"
