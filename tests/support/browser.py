"""The browser tests' Chromium (Debian's, driven by Playwright) and the folder their screenshots go to."""

from __future__ import annotations

from tests.support.servers import ROOT

CHROMIUM = "/usr/bin/chromium"


ARTIFACTS = ROOT / "test-artifacts"
