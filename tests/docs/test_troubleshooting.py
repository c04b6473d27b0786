"""The troubleshooting page against the code: each of its headings is an error message the code writes (the parts
that vary written ``...``), so a message reworded or removed fails here until the page follows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
ENTRY = re.compile(r"^### `(.+)`$", re.M)


def code_text() -> str:
    """The package's and the verifiers' source, adjacent string literals joined (a message split over lines reads
    as one)."""
    sources = [*(ROOT / "ggpo_lightning").rglob("*.py"), *(ROOT / "verifiers").rglob("*.py")]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    return re.sub(r"\"\s*\n\s*(?:f|rf|fr)?\"", "", text)


def fragments(message: str) -> list[str]:
    """The fixed parts of a heading's message: what lies between its ``...``."""
    return [part for part in message.split("...") if len(part.strip(" :;,.()")) >= 4]


def missing_messages(page: str, code: str) -> list[str]:
    return [message for message in ENTRY.findall(page)
            if not fragments(message) or any(part not in code for part in fragments(message))]


def test_every_troubleshooting_heading_is_a_message_of_the_code():
    page = PAGE.read_text(encoding="utf-8")
    assert len(ENTRY.findall(page)) >= 15
    assert not missing_messages(page, code_text())


def test_a_reworded_message_is_caught():
    page = "### `the checkpoint was written by a different run:`\n\n### `the checkpoint was written by another run`\n"
    assert missing_messages(page, code_text()) == ["the checkpoint was written by another run"]
