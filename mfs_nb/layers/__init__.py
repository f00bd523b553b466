"""What the payload is made of: the send view's projection and its layers (clearing, the fact track and the
working set, segments, the user-verbatim track, the knowledge slot, the cell log, attachments' snapshots)."""
