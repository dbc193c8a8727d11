"""What the tests share: live servers (servers), a browser (browser), files (files), runs (runs, distributed), a
store's rows (store), small models (tiny_models) and the device guard (device_guard). Fixtures are in tests/conftest.py."""
