"""What a prepared claim's containers get: the CDI spec, device nodes, the toolkit's edits."""
