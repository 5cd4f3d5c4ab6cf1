"""Model repositories: a local directory, a bucket behind the disk tier, and the choice between them."""
