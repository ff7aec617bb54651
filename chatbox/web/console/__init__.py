"""The admin console: its pages and actions, usage, moderation, workspaces and replicas."""
