"""The service: the functions the web UI and gradio_client share (launch, runs, groups, exports, datasets, previews,
health). Reads and writes through app.store; never imports Gradio or torch."""
