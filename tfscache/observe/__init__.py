"""What tfscache shows of itself: metrics, gauges, the /status document, the scale signal, the request log."""
