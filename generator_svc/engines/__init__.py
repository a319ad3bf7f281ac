"""Generation engines behind `tandem.generation.engine.GenerationEngine`."""
