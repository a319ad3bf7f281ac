"""Generation engines behind `generator_svc.interfaces.GenerationEngine`."""
