"""HTML and charts drawn from store rows: pure functions, no store, no Gradio."""
