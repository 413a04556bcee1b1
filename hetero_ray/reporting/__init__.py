"""Reports of finished (or running) runs: a self-contained HTML file and a text summary."""
