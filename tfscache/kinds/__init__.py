"""The kinds of model server behind tfscache: the NodeKind table, node processes, their memory."""
