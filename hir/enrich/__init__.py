"""Knowledge enrichment: entity text, attributes and images -> content vectors (content/)."""
