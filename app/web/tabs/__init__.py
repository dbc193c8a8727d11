"""One module per tab of the page; what the tabs share (shared) and the dashboard's own components (components)."""
