"""The run pickers' component: gr.Dropdown in the page, except for what it hands its listeners.

An event reads a picker when the browser sends it. When a run is deleted, the Runs tab's refresh can take it out of
the choices before an event sent earlier (a tick's redraw) is run, and gr.Dropdown refuses such an event with an
error in the server's log. A :class:`RunPicker` hands that listener no pick instead (None; the run left out of a
multiselect's list), which every listener already handles, and the refresh moves the picker itself.

A subclass rather than a wrapper: Gradio rebuilds a component from its class when an event updates its props (new
choices), so only the class carries the behaviour through. Gradio writes a type stub (``run_picker.pyi``) beside
the module of every component class it sees defined; the stub is generated, so git ignores it.
"""

import gradio as gr


class RunPicker(gr.Dropdown):
    """gr.Dropdown whose listeners get no pick, rather than a refusal, for a value no longer among its choices."""

    is_template = True  # the page draws it with gr.Dropdown's own component

    def preprocess(self, payload):
        present = [value for _, value in self.choices]
        if isinstance(payload, list):
            payload = [value for value in payload if value in present]
        elif payload not in present:
            payload = None
        return super().preprocess(payload)
