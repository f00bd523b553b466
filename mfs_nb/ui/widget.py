"""Base of the mfs_nb widgets: anywidget with plain ESM/CSS from `widgets/`, JSON view data in one
trait, and a readable text/HTML fallback where no widget front end runs (terminal, nbconvert)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import anywidget
import traitlets


def static_file(name: str) -> Path:
    """A front-end file: packaged beside the code in a wheel, in the top-level `widgets/` in a checkout."""
    here = Path(__file__).resolve().parent.parent
    for folder in (here / "widgets", here.parent / "widgets"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"mfs_nb front-end file {name} is missing; reinstall mfs_nb")


@cache
def esm(name: str) -> str:
    """One self-contained module: the shared helpers, then the widget (its import line dropped)."""
    common = static_file("common.js").read_text(encoding="utf-8")
    widget = static_file(name).read_text(encoding="utf-8")
    widget = re.sub(r'^import \{[^}]*\} from "\./common\.js";\n', "", widget, flags=re.M)
    return common + "\n" + widget


class Widget(anywidget.AnyWidget):
    """A view of JSON-ready data. Subclasses set `_esm` and implement `text()` and `html()`."""

    _css = static_file("mfs.css")
    data = traitlets.Dict().tag(sync=True)

    def text(self) -> str:
        raise NotImplementedError

    def html(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        mime = bundle[0] if isinstance(bundle, tuple) else bundle
        mime["text/plain"] = self.text()
        mime["text/html"] = self.html()
        return bundle
