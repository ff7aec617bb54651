"""The chat side of a user's data rules: erasing conversations and temporary chats."""
