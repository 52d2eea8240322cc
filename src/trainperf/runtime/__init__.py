"""Where the code runs and how a step executes: device, process context, the training step."""
