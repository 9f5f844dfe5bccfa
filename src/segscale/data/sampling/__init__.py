"""What a training step draws: where patches may lie, patches, samplers, loaders."""
