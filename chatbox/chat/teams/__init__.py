"""Teams: share links, workspaces, and who may do what with a conversation."""
