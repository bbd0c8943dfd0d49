"""The data formats: one record per format, its reader beside it."""
