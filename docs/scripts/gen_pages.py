"""Pages of the documentation site written at build time (mkdocs-gen-files): the configuration reference from the
code, and the pages whose text lives beside the code (the changelog, the recipes' table, the verifiers' how-to)."""

from pathlib import Path

import mkdocs_gen_files

from ggpo_lightning.cli.config_reference import reference_markdown

ROOT = Path(__file__).resolve().parents[2]

with mkdocs_gen_files.open("configuration.md", "w") as page:
    page.write(reference_markdown())

for source, page_name in (("CHANGELOG.md", "changelog.md"), ("recipes/README.md", "shipped-recipes.md"),
                          ("verifiers/README.md", "verifiers.md")):
    with mkdocs_gen_files.open(page_name, "w") as page:
        page.write((ROOT / source).read_text(encoding="utf-8"))
    mkdocs_gen_files.set_edit_path(page_name, f"../{source}")
