"""integration/: a Trainer (or several processes) end to end; the metrics pin"""
