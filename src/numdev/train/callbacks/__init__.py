"""callbacks."""
