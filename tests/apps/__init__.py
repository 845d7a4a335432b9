"""Small apps on the public join API, run as real workers by the tests."""
