"""Build-side tools that are not part of the export pipeline (run by hand, see each module)."""
