"""Rendering only: the HTML report and its charts, text tables, the run summary. No I/O."""
