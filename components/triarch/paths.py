"""Where the project's files live; one place so data is never looked up relative to a caller."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The checkout root (Pulumi.yaml lives here); the package is installed editable from it."""

STACKS_DIR = PROJECT_ROOT / "stacks"
TEMPLATES_DIR = PROJECT_ROOT / "templates"
COMPAT_DIR = TEMPLATES_DIR / "compat"
PROGRAM = PROJECT_ROOT / "__main__.py"
