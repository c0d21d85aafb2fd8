"""Drivers run INSIDE an engine venv (python drivers/<name>.py TIMELINE OUT): they import
the engine, never kvwatch, and write one JSON line {"t", "text"} per scrape."""
