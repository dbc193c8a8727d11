"""The dashboard's own components: Gradio's in the page, except for what they hand their listeners. An event reads
a component's value when the browser sends it, and the server may have moved the component's choices or bounds
since; Gradio refuses such an event with an error in the server's log, and the event is lost.

The pickers (of runs, of a run's evaluations): when a run is deleted, the Runs tab's refresh can take it out of the
choices before an event sent earlier (a tick's redraw) is run, and another run picked gives the evaluation pickers
other steps. A :class:`Picker` hands that listener no pick instead (None; the value left out of a multiselect's list),
which every listener already handles, and the refresh moves the picker itself.

A subclass rather than a wrapper: Gradio rebuilds a component from its class when an event updates its props (new
choices or bounds), so only the class carries the behaviour through. Gradio writes a type stub (``components.pyi``) beside
the module of every component class it sees defined; the stub is generated, so git ignores it.
"""

import gradio as gr


class Picker(gr.Dropdown):
    """gr.Dropdown whose listeners get no pick, rather than a refusal, for a value no longer among its choices (the
    run pickers, the Run tab's evaluation pickers)."""

    is_template = True  # the page draws it with gr.Dropdown's own component

    def preprocess(self, payload):
        present = [value for _, value in self.choices]
        if isinstance(payload, list):
            payload = [value for value in payload if value in present]
        elif payload not in present:
            payload = None
        return super().preprocess(payload)


class StepSlider(gr.Slider):
    """The Groups tab's step slider: gr.Slider in the page, whose bounds the server moves with the run's recorded
    steps. A step the page sent under the old bounds (a tick racing a deleted or newly picked run) is clamped into
    the new ones, where gr.Slider refuses it ("greater than maximum"); the listeners read any value as the nearest
    recorded step."""

    is_template = True  # the page draws it with gr.Slider's own component

    def preprocess(self, payload: float | None) -> float:
        if payload is not None:
            payload = min(max(payload, self.minimum), self.maximum)
        return super().preprocess(payload)
