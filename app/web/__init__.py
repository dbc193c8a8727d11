"""The Gradio web app: the page (ui), its API endpoints, its security middleware, the Launch form's layout, the tabs
(tabs/), what they draw (views/) and the styles (static/)."""
