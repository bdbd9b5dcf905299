"""The node's prepared claims: planning, the prepare/unprepare transaction, checkpoint, recovery."""
