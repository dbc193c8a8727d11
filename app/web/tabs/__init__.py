"""One module per tab of the page, and what the tabs share (shared)."""
