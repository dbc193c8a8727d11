"""The Launch form's model field in a real browser (Chromium through Playwright) on a live server: it offers the
models folder's models, an upload of a .gguf file stores it and selects it, a refused upload says why, and a typed
hub id is kept. Screenshots of the first section at 1280 and 1600 px go to test-artifacts/ (launch-model-WIDTH.png,
launch-model-uploaded-WIDTH.png, launch-model-choices-WIDTH.png)."""

from __future__ import annotations

import zipfile

import pytest
from playwright.sync_api import expect

from app.web.tabs.model_field import size_text
from tests.support.browser import ARTIFACTS
from tests.support.files import fake_model_dir, write_gguf
from tests.support.servers import browser_page, running_server, server_env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server (no worker) whose models folder already holds one model directory."""
    tmp = tmp_path_factory.mktemp("browser-models")
    fake_model_dir(tmp / "data" / "models" / "copied-by-hand")
    with running_server(tmp, server_env(tmp / "data", GRPO_HUB_CHECK_SECONDS="0")) as (url, _, _):
        yield url, tmp


def _model_input(page):
    return page.locator("#spec-model input").first


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 1600])
def test_the_model_field_offers_the_models_folder_and_selects_an_upload(server, tmp_path, width):
    url, tmp = server
    ARTIFACTS.mkdir(exist_ok=True)
    gguf = write_gguf(tmp_path / f"Tiny-{width}.Q4_1.gguf")
    bad = tmp_path / "escape.zip"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("../config.json", "{}")
    with browser_page(width=width, height=1000) as page:
        page.goto(url)
        page.click("#tab-launch-button")
        section = page.locator(".launch-section").first
        expect(_model_input(page)).to_have_value("builtin-arith · the built-in tiny model")
        upload = page.locator("#model-upload")
        expect(upload).to_contain_text("Upload a model (.gguf or .zip)")
        expect(page.locator("#model-upload-info")).to_be_hidden()  # no message yet: no gap under the field
        for box in (page.locator("#spec-model").bounding_box(), upload.bounding_box()):
            assert box["width"] > 200 and box["x"] + box["width"] <= width  # both in view, side by side
        section.screenshot(path=str(ARTIFACTS / f"launch-model-{width}.png"))

        _model_input(page).click()  # the choices: the built-in model and the folder's model
        options = page.get_by_role("option")
        expect(options.filter(has_text="models/copied-by-hand · model directory")).to_be_visible()
        page.wait_for_timeout(500)  # the list's opening transition
        page.screenshot(path=str(ARTIFACTS / f"launch-model-choices-{width}.png"))
        page.keyboard.press("Escape")
        section.locator("h4").click()  # the field loses focus, as a click on the upload would do

        before = sorted(p.name for p in (tmp / "data" / "models").iterdir())
        page.locator("#model-upload input[type=file]").set_input_files(str(bad))
        info = page.locator("#model-upload-info")
        expect(info.locator(".error")).to_contain_text("would unpack outside its folder")
        assert sorted(p.name for p in (tmp / "data" / "models").iterdir()) == before  # nothing left behind

        page.locator("#model-upload input[type=file]").set_input_files(str(gguf))
        expect(info.locator(".ok")).to_contain_text(f"models/Tiny-{width}.Q4_1.gguf")
        expect(info.locator(".ok")).to_contain_text("converts it once")
        expect(_model_input(page)).to_have_value(
            f"models/Tiny-{width}.Q4_1.gguf · .gguf, {size_text(gguf.stat().st_size)}"
        )
        expect(upload).to_contain_text("Upload a model")  # emptied for the next upload
        section.screenshot(path=str(ARTIFACTS / f"launch-model-uploaded-{width}.png"))

        typed = "Qwen/Qwen2.5-0.5B-Instruct"  # any value may be typed: a hub id here
        _model_input(page).fill(typed)
        _model_input(page).press("Enter")
        page.locator("#spec-name input, #spec-name textarea").first.click()
        expect(_model_input(page)).to_have_value(typed)
