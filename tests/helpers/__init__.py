"""Helpers of the tests that are not tests: fakes, recording callbacks, process runners."""
