"""The web server's guards, around the Gradio app: the middleware (security), the upload limits (uploads) and the
small ASGI pieces both answer through (asgi)."""
