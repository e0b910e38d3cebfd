"""The run: its folder (``folder``), its boots and records (``run.Run``), and what tests measure with
(``measure``). Plain Python; the plugin's session drives it from hooks."""
