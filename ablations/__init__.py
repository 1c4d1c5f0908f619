"""Ablation specs (Table 3 as data) and scale presets, shipped as package data."""
