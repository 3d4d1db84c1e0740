"""MkDocs hooks of the documentation site (mkdocs.yml's ``hooks``): the site serves its own
Mermaid, so that its diagrams draw without the internet.

Mermaid is the npm package pinned in ``mermaid/`` (its lock file), which
``scripts/bootstrap --test`` installs; this hook adds its one script, and its licence, to
the site's files, where ``extra_javascript`` loads it before the theme looks for a
``mermaid`` of its own (the theme fetches one from a CDN only when none is defined).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

PACKAGE = Path(__file__).resolve().parent.parent / "mermaid" / "node_modules" / "@mermaid-js" / "tiny"
# Where the site serves them (mkdocs.yml's extra_javascript names the script).
SERVED = {"javascripts/mermaid.tiny.js": PACKAGE / "dist" / "mermaid.tiny.js",
          "javascripts/mermaid.LICENSE.txt": PACKAGE / "LICENSE"}


def on_files(files: Files, config: Any) -> Files:
    for uri, source in SERVED.items():
        if not source.is_file():
            raise PluginError(f"{source} is missing: scripts/bootstrap --test installs the "
                              "site's pinned Mermaid (mermaid/package-lock.json)")
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files
