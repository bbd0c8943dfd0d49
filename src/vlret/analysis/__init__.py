"""Plots and paper-style tables."""
