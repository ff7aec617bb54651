"""The conversation API and the JSON of data, knowledge, workspaces and share links."""
