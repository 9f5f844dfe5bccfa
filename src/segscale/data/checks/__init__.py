"""The validation pass: every file checked once, what it learnt cached, the dataset's report."""
