"""The window: token counts (the class-weighted estimate, the offline counter), usage and its tiers, the one
budget of the window and its planned fill, the meter's anchor and calibration."""
