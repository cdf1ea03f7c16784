"""Bundles: algorithm templates (plain data) filled from data stats into training configs."""
