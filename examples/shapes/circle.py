import math


class Circle:
    """A circle of radius r."""

    def __init__(self, r):
        self.r = r

    def area(self):
        return math.pi * self.r ** 2

    def perimeter(self):
        return 2 * math.pi * self.r

    def __repr__(self):
        return f"Circle(r={self.r})"
