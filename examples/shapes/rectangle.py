class Rectangle:
    """A w by h rectangle."""

    def __init__(self, w, h):
        self.w = w
        self.h = h

    def area(self):
        return self.w * self.h

    def perimeter(self):
        return 2 * (self.w + self.h)

    def __repr__(self):
        return f"Rectangle(w={self.w}, h={self.h})"
