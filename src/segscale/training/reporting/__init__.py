"""What a run reports: metric loggers, figures, its times and plan, its evaluation."""
