"""The status bar under each `%%chat` reply: meter, tier colour, cache ratio, session, notices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from .data import status_html


def static_file(name: str) -> Path:
    """A front-end file: packaged beside the code in a wheel, in the top-level `widgets/` in a checkout."""
    here = Path(__file__).resolve().parent.parent
    for folder in (here / "widgets", here.parent / "widgets"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"mfs_nb front-end file {name} is missing; reinstall mfs_nb")


class StatusBar(anywidget.AnyWidget):
    _esm = static_file("status.js")
    _css = static_file("mfs.css")
    data = traitlets.Dict().tag(sync=True)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        mime = bundle[0] if isinstance(bundle, tuple) else bundle
        mime["text/plain"] = self.data.get("line", "")
        mime["text/html"] = status_html(self.data)
        return bundle
