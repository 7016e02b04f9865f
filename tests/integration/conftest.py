"""Integration fixtures: the live loopback server of tests/server/conftest.py, reused as is.

tests/ folders are not packages, so the module is loaded from its file; re-exporting its
fixture functions here registers them for this folder.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "ttftscope_server_fixtures", Path(__file__).resolve().parents[1] / "server" / "conftest.py")
_server_fixtures = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _server_fixtures   # dataclasses look their module up there
_spec.loader.exec_module(_server_fixtures)

LiveServer = _server_fixtures.LiveServer
server_factory = _server_fixtures.server_factory
